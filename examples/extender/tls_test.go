package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// testCA is a CA that signs serving and client certificates for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate and key (PEM) for cn, a server one for 127.0.0.1 or a client one.
func (ca *testCA) issue(t *testing.T, cn string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func parseFlags(t *testing.T, args ...string) *flags {
	t.Helper()
	fs := pflag.NewFlagSet("extender", pflag.ContinueOnError)
	f := newFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

// Flags that cannot work are refused at start-up, naming the fix.
func TestTLSFlagsRefused(t *testing.T) {
	t.Parallel()
	ca := writeFile(t, "ca.pem", newTestCA(t, "ca").pem)
	for args, want := range map[string]string{
		"--client_ca_file=" + ca:                "needs --cert_file and --key_file",
		"--allowed_client_names=kube-scheduler": "needs --client_ca_file",
		"--cert_file=x":                         "go together",
		"--client_ca_file=" + writeFile(t, "empty.pem", nil) + ",--cert_file=c,--key_file=k": "holds no PEM certificate",
	} {
		f := parseFlags(t, strings.Split(args, ",")...)
		if _, err := f.tlsConfig(); !errors.Is(err, errTLSFlags) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", args, err, want)
		}
	}
	if cfg, err := parseFlags(t).tlsConfig(); cfg != nil || err != nil {
		t.Errorf("no TLS flags: %v, %v", cfg, err)
	}
}

// The trusted identities default to the extender's and an empty flag trusts nobody.
func TestTrustedIdentityFlags(t *testing.T) {
	t.Parallel()
	f := parseFlags(t)
	if len(f.trustedUsers) != 2 || f.trustedUsers[0] != "system:serviceaccount:kube-system:hami-scheduler" || len(f.trustedGroups) != 1 {
		t.Errorf("defaults %v %v", f.trustedUsers, f.trustedGroups)
	}
	f = parseFlags(t, "--trusted_users=", "--trusted_groups=", "--allowed_client_names=a,b")
	if u, g := nonNil(f.trustedUsers), nonNil(f.trustedGroups); u == nil || len(u) != 0 || g == nil || len(g) != 0 {
		t.Errorf("empty flags: %#v %#v", u, g)
	}
	if len(f.allowedClientNames) != 2 {
		t.Errorf("allowed names %v", f.allowedClientNames)
	}
}

// With --client_ca_file, a client without a certificate, with one of another CA, or (with
// --allowed_client_names) with another common name fails the TLS handshake; kube-scheduler's
// certificate gets through.
func TestClientCertificates(t *testing.T) {
	t.Parallel()
	serverCA, clientCA, otherCA := newTestCA(t, "serving-ca"), newTestCA(t, "client-ca"), newTestCA(t, "other-ca")
	certPEM, keyPEM := serverCA.issue(t, "hami-scheduler", true)
	f := parseFlags(t, "--cert_file="+writeFile(t, "tls.crt", certPEM), "--key_file="+writeFile(t, "tls.key", keyPEM),
		"--client_ca_file="+writeFile(t, "client-ca.crt", clientCA.pem), "--allowed_client_names=kube-scheduler,kube-apiserver")
	cfg, err := f.tlsConfig()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: cfg, ErrorLog: nil, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.ServeTLS(ln, f.certFile, f.keyFile) }()
	t.Cleanup(func() { _ = srv.Close() })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.pem)
	get := func(client *testCA, cn string) error {
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if client != nil {
			c, k := client.issue(t, cn, false)
			pair, err := tls.X509KeyPair(c, k)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		conn, err := tls.Dial("tcp", ln.Addr().String(), tc)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		// TLS 1.3 reports the server's refusal of the client certificate at the first read.
		if _, err := io.WriteString(conn, "GET /filter HTTP/1.0\r\n\r\n"); err != nil {
			return err
		}
		b, err := io.ReadAll(conn)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "ok") {
			return errors.New("no answer: " + string(b))
		}
		return nil
	}
	if err := get(clientCA, "kube-scheduler"); err != nil {
		t.Errorf("kube-scheduler's certificate: %v", err)
	}
	for name, c := range map[string]struct {
		ca *testCA
		cn string
	}{"no certificate": {}, "another CA": {otherCA, "kube-scheduler"}, "another name": {clientCA, "mallory"}} {
		if err := get(c.ca, c.cn); err == nil || !strings.Contains(err.Error(), "tls") {
			t.Errorf("%s: err = %v, want a TLS alert", name, err)
		}
	}
}
