"""Code bundles: a user's working directory uploaded as a tar archive, checked from its headers before anything is
unpacked (``check``), stored once per owner and digest and unpacked for a job (``files``)."""
