"""What the gateway assumes of tiktoken beyond its documented API, in one place.

tiktoken downloads an encoding's BPE file on first use; the gateway must know beforehand
whether that would happen (``cached_locally``), which means mirroring where tiktoken's
loader keeps its files (``tiktoken.load.read_file_cached``: the cache directory's
variables and their precedence, a file named by the SHA-1 of its URL) and the URLs of the
encodings (in ``tiktoken_ext.openai_public``'s constructors). Neither is public, so the
installed version is checked against the range this was tested with.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from tiktoken.model import encoding_name_for_model as encoding_name_for_model

from gateway.compat.versions import require

TESTED = ((0, 8), (0, 15))

VERSION = require(
    "tiktoken",
    *TESTED,
    uses="its encoding cache's layout (tiktoken.load.read_file_cached) and encodings' URLs",
)

# Where tiktoken's own constructors download these encodings from. (cl100k_base is
# shipped with the gateway, gateway/text/cl100k.py: never looked for in the cache.)
ENCODING_URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
}


def cached_locally(encoding_name: str) -> bool:
    """Whether tiktoken would load this encoding from its cache without a download."""
    url = ENCODING_URLS.get(encoding_name)
    if url is None:
        return False
    # The same precedence as tiktoken.load.read_file_cached: a variable that is set wins,
    # even when empty.
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if cache_dir == "":
        return False  # tiktoken treats an empty value as "no cache"
    return os.path.exists(os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest()))
