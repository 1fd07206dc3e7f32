"""kernforge.sandbox"""
