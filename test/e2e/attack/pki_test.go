package attack_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Common names of the client certificates.
const (
	cnScheduler = "kube-scheduler"
	cnAPIServer = "kube-apiserver"
	cnMallory   = "mallory"
)

// pki is the test's certificates: a serving CA and the extender's serving certificate for
// 127.0.0.1; a client CA and client certificates of kube-scheduler, the API server and
// mallory (a name the extender does not allow); and a client certificate of kube-scheduler
// from another CA.
type pki struct {
	dir                   string
	servingCA, clientCA   string // CA files
	serverCert, serverKey string
	client                map[string]keyPair // by common name, of the client CA
	foreign               keyPair            // kube-scheduler's name, another CA
	servingCAPEM          []byte
	servingPool           *x509.CertPool
}

type keyPair struct{ cert, key string }

var serial atomic.Int64

type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(name string) (*ca, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return &ca{cert: cert, key: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// issue writes a certificate for cn signed by c (a serving one for 127.0.0.1 when server)
// and its key into dir, as <file>.crt and <file>.key.
func (c *ca) issue(dir, file, cn string, server bool) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return keyPair{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return keyPair{}, err
	}
	kp := keyPair{cert: filepath.Join(dir, file+".crt"), key: filepath.Join(dir, file+".key")}
	if err := os.WriteFile(kp.cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return keyPair{}, err
	}
	return kp, os.WriteFile(kp.key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
}

// newPKI makes the certificates in dir, and the API server's admission configuration
// (admission.yaml) whose webhook kubeconfig presents the kube-apiserver client certificate to
// every webhook ("*"), as examples/extender/deploy/README.md describes.
func newPKI(dir string) (*pki, error) {
	p := &pki{dir: dir, client: map[string]keyPair{}}
	serving, servingPEM, err := newCA("attack-serving-ca")
	if err != nil {
		return nil, err
	}
	client, clientPEM, err := newCA("attack-client-ca")
	if err != nil {
		return nil, err
	}
	other, _, err := newCA("attack-other-ca")
	if err != nil {
		return nil, err
	}
	p.servingCA, p.clientCA = filepath.Join(dir, "serving-ca.crt"), filepath.Join(dir, "client-ca.crt")
	p.servingCAPEM = servingPEM
	p.servingPool = x509.NewCertPool()
	p.servingPool.AddCert(serving.cert)
	if err := os.WriteFile(p.servingCA, servingPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.clientCA, clientPEM, 0o600); err != nil {
		return nil, err
	}
	srv, err := serving.issue(dir, "tls", "hami-scheduler", true)
	if err != nil {
		return nil, err
	}
	p.serverCert, p.serverKey = srv.cert, srv.key
	for _, cn := range []string{cnScheduler, cnAPIServer, cnMallory} {
		if p.client[cn], err = client.issue(dir, cn, cn, false); err != nil {
			return nil, err
		}
	}
	if p.foreign, err = other.issue(dir, "foreign", cnScheduler, false); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "webhook-kubeconfig.yaml")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: %s
    client-key: %s
`, p.client[cnAPIServer].cert, p.client[cnAPIServer].key), 0o600); err != nil {
		return nil, err
	}
	return p, os.WriteFile(filepath.Join(dir, "admission.yaml"), fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %s
`, kubeconfig), 0o600)
}

// tlsClient returns a TLS configuration that trusts the extender's serving CA and presents
// the client certificate kp (none when kp is empty).
func (p *pki) tlsClient(kp keyPair) (*tls.Config, error) {
	cfg := &tls.Config{RootCAs: p.servingPool, MinVersion: tls.VersionTLS12}
	if kp.cert != "" {
		pair, err := tls.LoadX509KeyPair(kp.cert, kp.key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
