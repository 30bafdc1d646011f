// Command scheduler is kube-scheduler v1.37 built with the HAMiGPU framework plugin
// (github.com/hamireg/hamireg/schedplugin), and HAMi's admission webhook, in one binary:
//
//	scheduler --config=config.yaml [kube-scheduler's flags]   # the scheduler
//	scheduler webhook --bind=:443 --cert-file=… --key-file=…  # the webhook
//
// Without the word webhook first it is kube-scheduler itself (the same flags, config file,
// leader election, /healthz, /readyz and /metrics), with the plugin registered under
// schedplugin.Name, which a KubeSchedulerConfiguration profile enables (deploy/config.yaml:
// profiles default-scheduler and hami-scheduler). With it, the binary serves only the SDK
// extender package's admission webhook (extender.Extender's /webhook, /healthz and /readyz),
// which gives GPU pods schedulerName hami-scheduler; it is a second mode rather than a part of
// the scheduler process so that the webhook serves on every replica while only the leader
// schedules, and so that kube-scheduler's command keeps exactly upstream's flags. deploy/
// runs both as two containers of one pod from the one image.
package main

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // for version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/hamireg/hamireg/schedplugin"
)

// webhookMode is the first argument that selects the webhook.
const webhookMode = "webhook"

func main() {
	os.Exit(cli.Run(command(os.Args[1:])))
}

// command is the webhook's command when args start with the word webhook, kube-scheduler's
// with the HAMiGPU plugin otherwise. Its arguments are args without that word.
func command(args []string) *cobra.Command {
	if len(args) > 0 && args[0] == webhookMode {
		cmd := newWebhookCommand()
		cmd.SetArgs(args[1:])
		return cmd
	}
	cmd := app.NewSchedulerCommand(app.WithPlugin(schedplugin.Name, schedplugin.NewFactory()))
	cmd.SetArgs(args)
	return cmd
}
