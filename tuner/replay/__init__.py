"""tuner.replay"""
