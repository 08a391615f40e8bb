"""The local driver's image store: OCI images and `docker save` tarballs imported once, each layer
unpacked once by its digest (ready to be an overlayfs lower directory) and shared by every image
that names it.

Pure decisions (`references`, `manifests`, `entries`) are apart from the I/O that follows them
(`sources` reads an archive or a layout, `extracting` unpacks a layer, `store` keeps the index,
`importing` drives an import from a source to a committed image). Nothing here speaks gRPC: the
gateway's ImageService calls `store` and `importing`.
"""
