"""kernforge.tasks"""
