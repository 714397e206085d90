"""Where table data lives besides the data directory: objects in S3-compatible buckets."""
