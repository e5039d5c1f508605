"""``python -m mlxprog.native``: build the native kernels now (if needed) and
say whether they are available."""

import sys

from . import status

if __name__ == "__main__":
    state = status()
    print(f"mlxprog native kernels: {state}" + (f"\n  {state.path}" if state.path else ""))
    sys.exit(0 if state.available else 1)
