// Pinned SeaweedFS: the S3 server of the batch-store tests (integration tier and kind e2e).
module zeps.dev/testbin/seaweedfs

go 1.26.6

require github.com/seaweedfs/seaweedfs v0.0.0-20261109003541-7506e5f91cd6
