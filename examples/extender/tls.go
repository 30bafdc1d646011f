package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
)

// errTLSFlags means the TLS flags cannot work together; the message names the fix.
var errTLSFlags = errors.New("invalid TLS flags")

// tlsConfig returns the server's TLS configuration beyond its certificate (ServeTLS loads
// --cert_file and --key_file): nil without --client_ca_file; with it, only clients whose
// certificate chains to that CA (kube-scheduler's for /filter and /bind, the API server's for
// /webhook) complete the handshake, and with --allowed_client_names only those whose
// certificate's common name is listed. A client CA without a serving certificate, or names
// without a client CA, are refused: they would protect nothing.
func (f *flags) tlsConfig() (*tls.Config, error) {
	switch {
	case f.clientCAFile != "" && (f.certFile == "" || f.keyFile == ""):
		return nil, fmt.Errorf("--client_ca_file %s needs --cert_file and --key_file: client certificates are only asked for over TLS: %w", f.clientCAFile, errTLSFlags)
	case len(f.allowedClientNames) > 0 && f.clientCAFile == "":
		return nil, fmt.Errorf("--allowed_client_names needs --client_ca_file, the CA the names are verified with: %w", errTLSFlags)
	case (f.certFile == "") != (f.keyFile == ""):
		return nil, fmt.Errorf("--cert_file and --key_file go together: %w", errTLSFlags)
	case f.clientCAFile == "":
		return nil, nil
	}
	pem, err := os.ReadFile(f.clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("read --client_ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--client_ca_file %s holds no PEM certificate: %w", f.clientCAFile, errTLSFlags)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	if names := f.allowedClientNames; len(names) > 0 {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return errors.New("no verified client certificate")
			}
			if cn := cs.VerifiedChains[0][0].Subject.CommonName; !slices.Contains(names, cn) {
				return fmt.Errorf("client certificate common name %q is not in --allowed_client_names", cn)
			}
			return nil
		}
	}
	return cfg, nil
}
