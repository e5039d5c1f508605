"""YaRN RoPE scaling (:func:`mlxprog.llm.models.llama.yarn`, read from
``config.json`` by ``rope_scaling_from_hf``): the periods and attention
factor against a numpy port of Hugging Face's formula (with and without
``truncate``), the rotation against mlx-lm's ``YarnRoPE``, and the configs
it refuses."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxprog.llm import ModelError
from mlxprog.llm.models.base import HFConfig
from mlxprog.llm.models.llama import rope_scaling_from_hf, yarn

#: gpt-oss's RoPE: theta 150000, head dim 64, rope_scaling as its config gives it.
GPT_OSS_SCALING = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                   "original_max_position_embeddings": 4096, "truncate": False}


def hf_yarn(base, dim, factor, original, beta_fast, beta_slow, truncate):
    """Hugging Face's YaRN inverse frequencies and attention factor
    (``_compute_yarn_parameters``), ported to numpy in float64."""
    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv_freq, 0.1 * math.log(factor) + 1.0


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("base, dim, factor, original, fast, slow", [
    (150000.0, 64, 32.0, 4096, 32.0, 1.0),
    (10000.0, 16, 4.0, 128, 32.0, 1.0),
    (1e6, 128, 8.0, 32768, 16.0, 2.0),
])
def test_yarn_is_hugging_faces_formula(truncate, base, dim, factor, original, fast, slow):
    ours = yarn(base, dim, factor, original, fast, slow, truncate)
    inv_freq, attention_factor = hf_yarn(base, dim, factor, original, fast, slow, truncate)
    np.testing.assert_allclose(1 / np.array(ours.freqs), inv_freq, rtol=1e-12)
    assert ours.attention_factor == pytest.approx(attention_factor, rel=1e-12)
    assert ours.scale == 1.0


def test_truncate_changes_the_blend():
    # gpt-oss's bounds are fractional: rounding them outward moves the blend.
    rounded = yarn(150000.0, 64, 32.0, 4096, truncate=True).freqs
    exact = yarn(150000.0, 64, 32.0, 4096, truncate=False).freqs
    assert not np.allclose(rounded, exact, rtol=1e-3)


def test_rotation_is_mlx_lms_yarn_rope():
    """mlx-lm's YarnRoPE (which always rounds the bounds outward) rotates as
    ``fast_rope`` with our periods, the features scaled by our factor."""
    from mlx_lm.models.rope_utils import YarnRoPE

    scaling = yarn(150000.0, 64, 32.0, 4096, 32.0, 1.0, truncate=True)
    theirs = YarnRoPE(64, base=150000.0, scaling_factor=32.0,
                      original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0)
    x = mx.random.normal((1, 2, 5, 64), key=mx.random.key(1))
    want = theirs(x, offset=3000)
    got = mx.fast.rope(x * scaling.attention_factor, 64, traditional=False, base=None,
                       scale=1.0, offset=3000, freqs=mx.array(scaling.freqs, dtype=mx.float32))
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)


def _config(**scaling) -> HFConfig:
    return HFConfig({"model_type": "gpt_oss", "max_position_embeddings": 131072,
                     "rope_scaling": scaling})


def test_gpt_oss_config():
    got = rope_scaling_from_hf(_config(**GPT_OSS_SCALING), 150000.0, 64,
                               allowed=("default", "yarn"))
    assert got == yarn(150000.0, 64, 32.0, 4096, 32.0, 1.0, truncate=False)
    assert got.attention_factor == pytest.approx(0.1 * math.log(32) + 1)


def test_hugging_faces_defaults_and_attention_factor_keys():
    defaults = rope_scaling_from_hf(_config(rope_type="yarn", factor=4.0), 10000.0, 16,
                                    allowed=("yarn",))
    assert defaults == yarn(10000.0, 16, 4.0, 131072, 32.0, 1.0, truncate=True)
    given = rope_scaling_from_hf(_config(rope_type="yarn", factor=4.0, attention_factor=1.5),
                                 10000.0, 16, allowed=("yarn",))
    assert given.attention_factor == 1.5
    both = rope_scaling_from_hf(_config(rope_type="yarn", factor=4.0, mscale=0.707,
                                        mscale_all_dim=0.707), 10000.0, 16, allowed=("yarn",))
    assert both.attention_factor == pytest.approx(1.0)


@pytest.mark.parametrize("scaling, match", [
    (dict(GPT_OSS_SCALING, factor=0), "rope_scaling factor must be a positive number"),
    (dict(GPT_OSS_SCALING, beta_fast="32"), "rope_scaling beta_fast must be a positive"),
    (dict(GPT_OSS_SCALING, truncate="no"), "rope_scaling truncate must be true or false"),
    (dict(GPT_OSS_SCALING, original_max_position_embeddings=-1),
     "original_max_position_embeddings must be a positive number"),
])
def test_bad_yarn_settings_name_the_key(scaling, match):
    with pytest.raises(ModelError, match=match):
        rope_scaling_from_hf(_config(**scaling), 150000.0, 64, allowed=("yarn",))


def test_families_without_yarn_refuse_it():
    with pytest.raises(ModelError, match="rope_scaling type 'yarn' is not supported"):
        rope_scaling_from_hf(_config(**GPT_OSS_SCALING), 150000.0, 64)
