//! Simulated cluster: DaemonSet controller stand-in and simulated nodes (placeholder).
