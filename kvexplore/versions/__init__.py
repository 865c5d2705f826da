"""Releases: one environment per vLLM release of the window, so answers can
come from a release other than the installed one, one deployment compared
across releases, and the vLLM x LMCache compatibility matrix."""

from kvexplore.versions.compare import (
    VersionComparison,
    compare_versions,
    deployment_facts,
)
from kvexplore.versions.environments import (
    check_environment,
    environment,
    environment_path,
    environment_problems,
    environments_dir,
    existing_environments,
    run_in,
)
from kvexplore.versions.matrix import Compatibility, compatibility

__all__ = [
    "Compatibility",
    "VersionComparison",
    "check_environment",
    "compatibility",
    "compare_versions",
    "deployment_facts",
    "environment",
    "environment_path",
    "environment_problems",
    "environments_dir",
    "existing_environments",
    "run_in",
]
