"""tuner.profile"""
