"""kernforge.archive"""
