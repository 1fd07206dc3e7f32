"""kernforge.tasks.builtin"""
