"""tuner.tune"""
