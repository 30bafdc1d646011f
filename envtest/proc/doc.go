// Package proc starts and stops the peer processes of the e2e tests and the quickstart (etcd,
// kube-apiserver, kube-scheduler, the device-manager child, the example programs) so that
// none of them outlives the process that started it.
//
// Every child is started with SysProcAttr{Pdeathsig: SIGKILL, Setpgid: true}: the kernel
// kills it when the test binary dies for any reason (panic, test timeout, SIGKILL), and
// [Process.Stop] signals its whole process group. Pdeathsig fires when the *thread* that
// forked the child exits, not the process; the Go runtime may retire threads, so a
// [Spawner] forks every child from one goroutine locked to its OS thread for the spawner's
// lifetime. [Spawner.Close] ends that goroutine, and with it the thread, which SIGKILLs any
// child still alive.
//
// Lifecycle: NewSpawner, then Spawner.Start for each child, Process.Stop for each child,
// Spawner.Close last. All methods are safe for concurrent use.
package proc
