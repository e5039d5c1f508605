"""GGML's tensor types (GGUF's weights): the type table (:mod:`.types`), and
the MLX forms of their blocks: dequantizers written with MLX ops (any
device) and the re-layout of the types MLX's affine quantization holds
exactly."""
