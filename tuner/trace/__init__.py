"""tuner.trace"""
