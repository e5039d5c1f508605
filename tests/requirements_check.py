"""Whether the packages the suite needs are installed, read from pyproject.toml."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency reads TOML there
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def missing_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """What keeps the packages the README's test command installs (the
    project's dependencies and its ``test`` extra, as ``pyproject`` lists
    them) from being there: one line per package not installed, or
    installed at a version the requirement excludes."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    problems = []
    for line in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": "test"}):
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{requirement.name} is not installed (pyproject.toml asks for "
                            f"{line!r})")
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            problems.append(f"{requirement.name} {installed} is installed; pyproject.toml "
                            f"asks for {line!r}")
    return problems
