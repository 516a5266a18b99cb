"""The `task` module a GPU MODE submission imports (`from task import input_t, output_t`).

GPU MODE's template starts every submission with these imports; its harness ships a task.py
beside the submission. The candidate worker puts this folder on the path, so a submission runs
here unchanged. The type variables are annotations only (Python erases their bounds at run time).
"""
from typing import TypedDict, TypeVar

input_t = TypeVar("input_t")
output_t = TypeVar("output_t")


class TestSpec(TypedDict, total=False):
    """A test case's parameters (GPU MODE's task.py names its type; the fields vary by problem)."""
