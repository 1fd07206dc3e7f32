"""kernforge.loop"""
