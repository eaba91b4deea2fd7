//! The in-process Kubernetes API server (placeholder).
