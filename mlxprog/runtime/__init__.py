"""Running validated programs: planning (:mod:`.plan`), compiled segments
(:mod:`.segment`), the block runner (:mod:`.runner`) and its interpreter
(:mod:`.interpreter`), values in and out (:mod:`.binding`), options and
stats (:mod:`.options`), and executables with ``compile`` (:mod:`.executable`)."""
