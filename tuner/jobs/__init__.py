"""tuner.jobs"""
