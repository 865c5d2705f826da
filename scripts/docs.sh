#!/usr/bin/env bash
# Build the documentation site into site/ (static HTML, relative links):
# README.md's sections, every notebook with its stored outputs, and the API
# reference from the docstrings. Extra arguments go to `mkdocs build`.
# Serve it with: python -m http.server -d site 8000
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e ".[docs]" -c scripts/default-release.txt
# (quiet Material's notice about its successor; it changes nothing built)
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict "$@"
