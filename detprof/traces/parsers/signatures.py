"""The leading bytes that say what a file holds, shared by format detection and the parsers that check them."""

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
