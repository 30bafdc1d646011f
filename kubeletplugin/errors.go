package kubeletplugin

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap one of them; match with errors.Is.
var (
	// ErrInvalidOptions is wrapped by New for Options it cannot use.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrKubeletSocketMissing means kubelet.sock is not in the plugin folder: the kubelet is
	// not running, or it runs with another --root-dir, or the folder is not mounted into the
	// plugin's container. The detail is a [*KubeletSocketError].
	ErrKubeletSocketMissing = errors.New("kubelet socket missing")
	// ErrRegistrationRejected means the kubelet answered Register (or, in ModePluginWatcher,
	// NotifyRegistrationStatus) with an error: bad version, invalid resource name, or it
	// could not dial the plugin back. The detail is a [*RegistrationError].
	ErrRegistrationRejected = errors.New("registration rejected by the kubelet")
	// ErrSocketInUse means another live plugin (in this or another process) serves the same
	// socket; starting would make the kubelet see one endpoint registered twice.
	ErrSocketInUse = errors.New("plugin socket in use")
	// ErrAlreadyRunning is returned by Run while another Run of the same Plugin is active.
	ErrAlreadyRunning = errors.New("plugin already running")
)

// KubeletSocketError says where kubelet.sock was looked for. It wraps
// [ErrKubeletSocketMissing].
type KubeletSocketError struct {
	// Dir is the plugin folder that was searched.
	Dir string
	// Err is the underlying error of the stat or watch (often fs.ErrNotExist).
	Err error
}

func (e *KubeletSocketError) Error() string {
	return fmt.Sprintf("find kubelet.sock in %s: %v: %v; the kubelet reads device-plugin sockets from <--root-dir>/device-plugins: "+
		"check the kubelet's --root-dir with `ps aux | grep kubelet` and set PluginDir to that folder (PluginDirFromRootDir), "+
		"mounted at the same path in the plugin's container", e.Dir, ErrKubeletSocketMissing, e.Err)
}

// Unwrap returns ErrKubeletSocketMissing and the underlying error.
func (e *KubeletSocketError) Unwrap() []error { return []error{ErrKubeletSocketMissing, e.Err} }

// RegistrationError is a registration the kubelet rejected. It wraps
// [ErrRegistrationRejected] and the gRPC error, whose message is the kubelet's.
type RegistrationError struct {
	// KubeletSocket is the kubelet socket Register was sent to (empty in ModePluginWatcher).
	KubeletSocket string
	// Endpoint and ResourceName are the values the plugin sent.
	Endpoint     string
	ResourceName string
	// Err is the kubelet's answer.
	Err error
}

func (e *RegistrationError) Error() string {
	return fmt.Sprintf("register %s (endpoint %s) with the kubelet at %s: %v: %v",
		e.ResourceName, e.Endpoint, e.KubeletSocket, ErrRegistrationRejected, e.Err)
}

// Unwrap returns ErrRegistrationRejected and the kubelet's error.
func (e *RegistrationError) Unwrap() []error { return []error{ErrRegistrationRejected, e.Err} }
