"""tuner.sim"""
