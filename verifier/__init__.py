"""kernforge.verifier"""
