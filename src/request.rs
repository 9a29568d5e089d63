//! The GPU request a container makes through NVIDIA_* variables and device mounts.
