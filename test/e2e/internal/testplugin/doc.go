// Package testplugin is a minimal device plugin (deviceplugin v1beta1) used to prove that
// the kubelet peers in kubeletpeer behave like the kubelet: it serves DevicePlugin on a unix
// socket, registers with a kubelet.sock, streams its device list through ListAndWatch and
// re-sends it on every SetDevices. It is not the SDK's plugin (package kubeletplugin) and
// does nothing clever: no re-registration, no health checks.
//
// Lifecycle: Start serves; Register may be called once per serving period; Stop ends the
// gRPC server (closing ListAndWatch, which the kubelet sees as a disconnect) and removes
// the socket; Restart serves again on the same path. Methods are safe for concurrent use.
package testplugin
