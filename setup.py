"""Packaging for Patroller."""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(
    r'__version__ = "([^"]+)"', (HERE / "patroller" / "__init__.py").read_text()
).group(1)
REQUIRES = [
    line.strip()
    for line in (HERE / "requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="patroller",
    version=VERSION,
    description="Know which user is on which GPU of a shared host, and hand out free GPUs fairly",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="GPL-3.0-or-later",
    packages=find_packages(include=["patroller", "patroller.*"]),
    python_requires=">=3.10",  # orjson 3.13 needs 3.10; tests/test_setup.py installs on it
    install_requires=REQUIRES,
    package_data={
        "patroller.http": ["openapi.json", "web/*"],
        "patroller.cli": ["patroller.service"],
    },
    # schemathesis 4 (the API fuzzer of tests/test_fuzz.py) needs Python 3.11
    # kubernetes: containerd's API and the kubelet's pod-resources are gRPC (grpcio alone: the
    # messages are encoded by patroller itself, so neither protobuf nor generated code is needed)
    # test: protobuf and grpcio-tools (protoc) check that encoding against the real thing, from
    # the .proto files of tests/fixtures/proto (tests/test_protobuf_wire.py)
    # notify: notifications (e-mail, Slack, ntfy, webhooks, ...) are sent through Apprise;
    # the tests receive them with a real SMTP server (aiosmtpd) and HTTP receivers; the type
    # checker (mypy) and the linter and formatter (ruff; .ci/run runs both, their settings in
    # pyproject.toml) come with the tests
    extras_require={
        "kubernetes": ["grpcio>=1.60"],
        "notify": ["apprise>=1.9"],
        "test": [
            "pytest>=8.4",
            "pytest-timeout>=2.4",
            "selenium>=4.20",
            "grpcio>=1.60",
            "protobuf>=5.26",
            "grpcio-tools>=1.64",
            "apprise>=1.9",
            "aiosmtpd>=1.4",
            "mypy>=1.10",
            "ruff>=0.17,<0.18",  # the formatter's style may change at 0.18
            "schemathesis>=4,<5; python_version >= '3.11'",
        ],
        # scripts/mutation.sh: mutmut 3 (its [tool.mutmut] in pyproject.toml);
        # a development tool, never needed to run or test Patroller
        "mutation": ["mutmut>=3.8.1,<3.9"],
    },
    entry_points={"console_scripts": ["patroller = patroller.main:main"]},
    classifiers=[
        "License :: OSI Approved :: GNU General Public License v3 or later (GPLv3+)",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Operating System :: POSIX :: Linux",
        "Environment :: No Input/Output (Daemon)",
    ],
)
