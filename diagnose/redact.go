package diagnose

import (
	"bytes"
	"regexp"
)

// Redacted replaces every secret [Redact] removes.
const Redacted = "[REDACTED]"

// redactedPEM replaces a whole PEM block (certificate, key), markers included, so that the
// output holds no block a PEM reader would find.
const redactedPEM = "[REDACTED PEM BLOCK]"

var (
	pemBegin = []byte("-----BEGIN")
	pemEnd   = []byte("-----END")
	// secretKey matches a key whose value is a credential, in YAML ("token: v"), JSON
	// ("token":"v"), flag ("--token=v") or environment ("TOKEN=v") form, up to its value.
	secretKey = regexp.MustCompile(`(?i)(?:^|[^A-Za-z0-9])(?:\\?["'])?(?:token|id-token|refresh-token|access-token|bearer-token|bearertoken|password|certificate-authority-data|client-certificate-data|client-key-data|cabundle)(?:\\?["'])?[ \t]*[:=][ \t]*`)
	// bearer matches a bearer token ("Authorization: Bearer …", "bearer …" in a log).
	bearer = regexp.MustCompile(`(?i)\b(bearer)[ \t]+[A-Za-z0-9\-._~+/=]{8,}`)
	// basic matches the credential of an Authorization header's Basic scheme.
	basic = regexp.MustCompile(`(?i)(authorization(?:\\?["'])?[ \t]*[:=][ \t]*(?:\\?["'])?basic)[ \t]+[A-Za-z0-9+/=]+`)
	// jwt matches a JSON Web Token anywhere (a ServiceAccount token, an OIDC id-token).
	jwt = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*`)
)

// Redact returns data without the secrets a kubeconfig, a ConfigMap, a webhook configuration
// or a log may hold: PEM blocks ("-----BEGIN …-----" to "-----END …-----", or to the end of
// the base64 lines that follow when the end marker is missing) become "[REDACTED PEM BLOCK]";
// the values of token, id-token, refresh-token, access-token, password,
// certificate-authority-data, client-certificate-data, client-key-data and caBundle entries
// (YAML, JSON, escaped JSON, --flag= and KEY= forms, any case), bearer tokens ("Bearer …"),
// Basic Authorization credentials and JSON Web Tokens become "[REDACTED]". A YAML block scalar ("token: |") loses
// its indented lines. The output never contains "-----BEGIN". Redact is pure and never
// panics; data is not modified.
func Redact(data []byte) []byte {
	out := redactPEM(data)
	out = redactKeys(out)
	out = bearer.ReplaceAll(out, []byte("$1 "+Redacted))
	out = basic.ReplaceAll(out, []byte("$1 "+Redacted))
	out = jwt.ReplaceAll(out, []byte(Redacted))
	// A marker left over (an END-less block inside a line, a marker formed by the
	// replacements) is neutralised: the replacement holds no '-', so no new one can form.
	return bytes.ReplaceAll(out, pemBegin, []byte(redactedPEM))
}

// redactPEM replaces every PEM block.
func redactPEM(data []byte) []byte {
	var out []byte
	rest := data
	for {
		i := bytes.Index(rest, pemBegin)
		if i < 0 {
			return append(out, rest...)
		}
		out = append(out, rest[:i]...)
		out = append(out, redactedPEM...)
		rest = rest[i:]
		if j := bytes.Index(rest, pemEnd); j >= 0 {
			rest = skipMarkerTail(rest[j+len(pemEnd):])
			continue
		}
		rest = skipBase64Lines(rest)
	}
}

// skipMarkerTail skips " CERTIFICATE-----" after "-----END": up to and with the next
// "-----" on the same line, or to the end of the line.
func skipMarkerTail(b []byte) []byte {
	line := b
	if k := bytes.IndexByte(b, '\n'); k >= 0 {
		line = b[:k]
	}
	if k := bytes.Index(line, []byte("-----")); k >= 0 {
		return b[k+len("-----"):]
	}
	return b[len(line):]
}

// skipBase64Lines skips the rest of the line that opens an END-less block and the lines
// after it that hold only base64 and blanks.
func skipBase64Lines(b []byte) []byte {
	k := bytes.IndexByte(b, '\n')
	if k < 0 {
		return nil
	}
	b = b[k+1:]
	for len(b) > 0 {
		line := b
		k := bytes.IndexByte(b, '\n')
		if k >= 0 {
			line = b[:k]
		}
		if len(bytes.TrimSpace(line)) == 0 || !isBase64Line(line) {
			return b
		}
		if k < 0 {
			return nil
		}
		b = b[k+1:]
	}
	return b
}

// isBase64Line reports whether the line, blanks around it aside, is one word of base64.
func isBase64Line(line []byte) bool {
	for _, c := range bytes.TrimSpace(line) {
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '+', c == '/', c == '=':
		default:
			return false
		}
	}
	return true
}

// redactKeys replaces the values of the credential keys of secretKey.
func redactKeys(data []byte) []byte {
	locs := secretKey.FindAllIndex(data, -1)
	if len(locs) == 0 {
		return data
	}
	out := make([]byte, 0, len(data))
	pos := 0
	for _, loc := range locs {
		if loc[1] < pos {
			continue // inside a value already redacted
		}
		start := max(loc[1], pos)
		out = append(out, data[pos:start]...)
		end := valueEnd(data, start)
		if end > start {
			out = append(out, Redacted...)
		}
		pos = end
	}
	return append(out, data[pos:]...)
}

// valueEnd returns where the value that starts at i ends: the closing quote of a quoted
// value ("v", 'v', \"v\"), the end of the indented lines of a block scalar (| or >), or the
// first blank, quote, comma, brace, bracket or backslash of a bare value.
func valueEnd(data []byte, i int) int {
	if i >= len(data) {
		return i
	}
	switch c := data[i]; {
	case c == '"' || c == '\'':
		return quotedEnd(data, i+1, []byte{c})
	case c == '\\' && i+1 < len(data) && data[i+1] == '"':
		return quotedEnd(data, i+2, []byte(`\"`))
	case c == '|' || c == '>':
		return blockEnd(data, i)
	}
	j := i
	for j < len(data) {
		switch data[j] {
		case ' ', '\t', '\r', '\n', '"', '\'', ',', '}', ']', '\\', ';', '&':
			return j
		}
		j++
	}
	return j
}

// quotedEnd returns the index just after the closing quote, or the end of the line when
// the quote is not closed on it.
func quotedEnd(data []byte, i int, quote []byte) int {
	line := data[i:]
	if k := bytes.IndexByte(line, '\n'); k >= 0 {
		line = line[:k]
	}
	if k := bytes.Index(line, quote); k >= 0 {
		return i + k + len(quote)
	}
	return i + len(line)
}

// blockEnd returns the end of a YAML block scalar opened at i: the indicator's line, then
// every line indented more than the key's line.
func blockEnd(data []byte, i int) int {
	lineStart := bytes.LastIndexByte(data[:i], '\n') + 1
	keyIndent := indentOf(data[lineStart:])
	k := bytes.IndexByte(data[i:], '\n')
	if k < 0 {
		return len(data)
	}
	j := i + k + 1
	if j >= len(data) {
		return j - 1
	}
	for j < len(data) {
		next := data[j:]
		n := bytes.IndexByte(next, '\n')
		line := next
		if n >= 0 {
			line = next[:n]
		}
		if len(bytes.TrimSpace(line)) > 0 && indentOf(line) <= keyIndent {
			return j - 1 // keep the line break before the next key
		}
		if n < 0 {
			return len(data)
		}
		j += n + 1
	}
	return j
}

func indentOf(line []byte) int {
	n := 0
	for n < len(line) && (line[n] == ' ' || line[n] == '\t' || line[n] == '-') {
		n++
	}
	return n
}
