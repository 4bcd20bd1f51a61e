"""rotvid.rope"""
