//! cgroup device rules: v1 devices.allow and v2 BPF device programs.
