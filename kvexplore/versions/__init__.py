"""Releases: one environment per vLLM release of the window, so answers can
come from a release other than the installed one."""

from kvexplore.versions.environments import (
    environment,
    environment_path,
    environments_dir,
    existing_environments,
    run_in,
)

__all__ = [
    "environment",
    "environment_path",
    "environments_dir",
    "existing_environments",
    "run_in",
]
