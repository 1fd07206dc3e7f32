"""kernforge: a self-improving kernel-writing agent.

The repository root is the package; its sub-packages follow the data flow
tasks -> loop -> prompts -> (LLM) -> sandbox -> verifier -> archive -> export.
"""

__version__ = "0.1.0"
