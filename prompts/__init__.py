"""kernforge.prompts"""
