"""rotvid.eval"""
