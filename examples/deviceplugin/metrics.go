package main

// defaultMetricsBindAddress is HAMi's monitor's --metrics-bind-address: the port that its
// Service hami-device-plugin-monitor (NodePort 31992) targets and its dashboards scrape.
const defaultMetricsBindAddress = ":9394"
