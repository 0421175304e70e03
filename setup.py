"""One import name, `recpipe`, over the design's top-level folders: features/ installs as
recpipe.features, pipeline/ as recpipe.pipeline, trainers/ as recpipe.trainers and serving/ as
recpipe.serving, beside recpipe/ itself (the CLI, the public API, the ground floor, the benchmarks).
Metadata and dependencies are in setup.cfg."""
from setuptools import find_packages, setup

FOLDERS = {"recpipe": "recpipe", "recpipe.features": "features", "recpipe.pipeline": "pipeline",
           "recpipe.trainers": "trainers", "recpipe.serving": "serving"}

packages = []
for name, folder in FOLDERS.items():
    packages += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]

setup(package_dir=FOLDERS, packages=packages)
