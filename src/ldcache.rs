//! glibc ld.so.cache: read (host lookup) and write (container update).
