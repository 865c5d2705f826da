"""Releases: one environment per vLLM release of the window, so answers can
come from a release other than the installed one, one deployment compared
across releases, and the vLLM x LMCache compatibility matrix.

``VersionComparison``, ``compare_versions``, ``deployment_facts``,
``Compatibility`` and ``compatibility`` are imported on first use (they
import vLLM); the environments' functions are not."""

from kvexplore.lazy import lazy_attributes
from kvexplore.versions.environments import (
    check_environment,
    environment,
    environment_path,
    environment_problems,
    environments_dir,
    existing_environments,
    run_in,
)

#: Names imported on first use (their modules import vLLM): the environments
#: alone stay cheap, for ``kvexplore envs``.
__getattr__ = lazy_attributes(__name__, {
    **dict.fromkeys(("VersionComparison", "compare_versions", "deployment_facts"),
                    "kvexplore.versions.compare"),
    **dict.fromkeys(("Compatibility", "compatibility"), "kvexplore.versions.matrix"),
})

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
