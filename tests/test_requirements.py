"""The suite refuses to run without its dependencies (``conftest.py`` asks
``requirements_check``), so a test that needs one cannot quietly skip."""

from __future__ import annotations

from importlib import metadata

from requirements_check import missing_requirements


def test_a_missing_or_too_old_package_is_named(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["numpy>=1.0", "no-such-package-here>=1"]\n'
                         '[project.optional-dependencies]\n'
                         'test = ["pytest>=999", "onnx; sys_platform == \'no-such-os\'"]\n')
    assert missing_requirements(pyproject) == [
        "no-such-package-here is not installed (pyproject.toml asks for "
        "'no-such-package-here>=1')",
        f"pytest {metadata.version('pytest')} is installed; pyproject.toml asks for "
        "'pytest>=999'",
    ]
