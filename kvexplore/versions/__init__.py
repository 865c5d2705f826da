"""Releases: one environment per vLLM release of the window, so answers can
come from a release other than the installed one, and one deployment compared
across releases."""

from kvexplore.versions.compare import (
    VersionComparison,
    compare_versions,
    deployment_facts,
)
from kvexplore.versions.environments import (
    environment,
    environment_path,
    environments_dir,
    existing_environments,
    run_in,
)

__all__ = [
    "VersionComparison",
    "compare_versions",
    "deployment_facts",
    "environment",
    "environment_path",
    "environments_dir",
    "existing_environments",
    "run_in",
]
