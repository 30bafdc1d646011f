package main

// defaultMetricsBindAddress is where the plugin serves /metrics and its probes: beside HAMi's
// ports (9394 the NVIDIA plugin's monitor, 9395 the scheduler's metrics), so that it can run on
// a host with either.
const defaultMetricsBindAddress = ":9396"
