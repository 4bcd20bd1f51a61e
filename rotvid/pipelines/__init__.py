"""rotvid.pipelines"""
