"""Code bundles: a packed working directory uploaded once, which a script job's ``code`` names by digest."""

from __future__ import annotations

from pathlib import Path

import httpx

from torchyard.client.errors import NotFound
from torchyard.client.http import HttpSession, api_path
from torchyard.client.models import CodeBundle
from torchyard.client.pack import pack


class CodeBundlesApi(HttpSession):
    def code_exists(self, digest: str) -> bool:
        """Whether the server already has this bundle for this key's owner."""
        try:
            self._request("HEAD", api_path("code", digest))
        except NotFound:
            return False
        return True

    def upload_code(self, workdir: str | Path) -> CodeBundle:
        """Pack ``workdir`` (honouring .gitignore and .torchyardignore, without .git) and upload it unless
        the server already has the same archive; the bundle's ``digest`` goes in a spec's ``code``."""
        with pack(workdir) as packed:
            if self.code_exists(packed.digest):
                return CodeBundle(digest=packed.digest, size_bytes=packed.size_bytes, files=packed.files, uploaded=False)
            gzip = packed.compressible()
            headers = {"Content-Type": "application/x-tar", **({"Content-Encoding": "gzip"} if gzip else {})}
            response = self._request("POST", "/v1/code", params={"digest": packed.digest}, content=packed.chunks(gzip=gzip),
                                     headers=headers, timeout=httpx.Timeout(self._http.timeout.connect, read=600.0, write=600.0))
            return CodeBundle.model_validate({**response.json(), "uploaded": response.status_code == 201})
