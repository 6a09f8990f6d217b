// legato-web-recorder: the desktops' web recorder (recorder.py, issue 34). An HTTP(S) proxy
// that intercepts TLS with certificates signed by the recorder's CA (made and cached per
// host by Google's martian/mitm), serves the browser HTTP/2 or HTTP/1.1 as it offers (Go's
// net/http server), forwards each request with Go's httputil.ReverseProxy and http.Transport
// (HTTP/2 to the sites that offer it), and writes every exchange it forwarded, request and
// response bodies as they crossed the wire (not decoded), one JSON object a line to -out and
// the bodies raw to -bodies. Answers are passed on as they arrive (streams too).
// The desktop server turns that file into mitmproxy's flow file at the attempt's end
// (web_exchanges.py); replaying stays mitmproxy's. Written in Go because mitmproxy itself
// cost 1.2-2.1 ms of CPU per request inside the steps (BENCHMARKS.md, issue 34).
//
// Flags: -listen ADDR, -ca PEM (the CA's key and certificate: mitmproxy-ca.pem), -out FILE and
// -bodies FILE (the exchanges; their bodies),
// -hosts JSON ({"name": "addr:port"} or {"name": "addr"}: names dialled elsewhere, for
// stand-in sites and mirrors; the TLS server name stays the name), -trusted PEM (the roots
// the sites' certificates are checked against; default: the system's), -upstream URL (a
// proxy the exchanges go through), -max-body-mib N (default 256: a bigger request body is
// answered 502; a bigger response body is passed on, not recorded), -max-held-mib N
// (default 1024: the copies of all answers in flight together; an answer that would pass it
// is passed on, not recorded). SIGTERM: stop, flush, exit 0.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/ioutil"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/martian/mitm"
)

// A client's request head must arrive within headerTimeout; an idle kept-alive connection
// is closed after idleTimeout (a page's connections are reused for minutes, not hours).
const (
	headerTimeout = 60 * time.Second
	idleTimeout   = 5 * time.Minute
)

// exchange is one line of -out (web_exchanges.py reads it): times in seconds since the epoch,
// headers as Go parsed them (one pair a value), bodies as sent, written raw to -bodies:
// request_body and response_body are [offset, length] there.
type exchange struct {
	Start           float64     `json:"start"`
	End             float64     `json:"end"`
	Method          string      `json:"method"`
	Scheme          string      `json:"scheme"`
	Host            string      `json:"host"`
	Port            int         `json:"port"`
	Path            string      `json:"path"`
	HTTPVersion     string      `json:"http_version"`
	RequestHeaders  [][2]string `json:"request_headers"`
	RequestBody     []byte      `json:"-"`
	RequestBodyAt   [2]int64    `json:"request_body"`
	Status          int         `json:"status"`
	Reason          string      `json:"reason"`
	ResponseVersion string      `json:"response_version"`
	ResponseHeaders [][2]string `json:"response_headers"`
	ResponseBody    []byte      `json:"-"`
	ResponseBodyAt  [2]int64    `json:"response_body"`
}

// recorder queues finished exchanges for the writer goroutine.
type recorder struct {
	lines  chan *exchange
	mu     sync.Mutex
	closed bool
}

func (r *recorder) add(ex *exchange) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.lines <- ex
	}
}

// close ends the queue: exchanges finishing later are not written (their request went out,
// their answer did not come back before the attempt ended).
func (r *recorder) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	close(r.lines)
}

func headerPairs(h http.Header, host string) [][2]string {
	pairs := make([][2]string, 0, len(h)+1)
	if host != "" {
		pairs = append(pairs, [2]string{"Host", host})
	}
	for name, values := range h {
		for _, v := range values {
			pairs = append(pairs, [2]string{name, v})
		}
	}
	return pairs
}

// errTooLarge: a request body beyond -max-body-mib (the recorder reads a request's body
// whole before sending it on).
var errTooLarge = errors.New("body too large to record")

func readAll(body io.ReadCloser, limit int64) ([]byte, error) {
	if body == nil || body == http.NoBody {
		return nil, nil
	}
	defer body.Close()
	data, err := ioutil.ReadAll(io.LimitReader(body, limit+1))
	if err == nil && int64(len(data)) > limit {
		return nil, errTooLarge
	}
	return data, err
}

func seconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// recordingTransport is the reverse proxy's transport: it reads the request's body whole
// (up to the limit: beyond, the request fails with errTooLarge, answered 502), and passes
// the site's answer on as it arrives, keeping a copy (teeBody) that becomes the recorded
// exchange when the body ends. A WebSocket's upgrade (101) is recorded without its
// messages and relayed as it is.
type recordingTransport struct {
	base  http.RoundTripper
	rec   *recorder
	limit int64   // bytes a body may have
	held  *budget // bytes the copies of the answers in flight may have together
}

func (t recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	sent, err := readAll(req.Body, t.limit)
	if err != nil {
		return nil, err
	}
	if sent != nil {
		req.Body = ioutil.NopCloser(bytes.NewReader(sent))
		req.GetBody = func() (io.ReadCloser, error) { return ioutil.NopCloser(bytes.NewReader(sent)), nil }
	}
	start := time.Now()
	res, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	port := 80
	if req.URL.Scheme == "https" {
		port = 443
	}
	if p := req.URL.Port(); p != "" {
		fmt.Sscanf(p, "%d", &port)
	}
	reason := http.StatusText(res.StatusCode)
	if len(res.Status) > 4 {
		reason = res.Status[4:]
	}
	ex := &exchange{
		Start:           seconds(start),
		Method:          req.Method,
		Scheme:          req.URL.Scheme,
		Host:            req.URL.Hostname(),
		Port:            port,
		Path:            originForm(req.URL), // the path as the browser sent it (keepRawPath)
		HTTPVersion:     res.Proto,           // what the site was spoken to in
		RequestHeaders:  headerPairs(req.Header, req.Host),
		RequestBody:     sent,
		Status:          res.StatusCode,
		Reason:          reason,
		ResponseVersion: res.Proto,
		ResponseHeaders: headerPairs(res.Header, ""),
	}
	if res.StatusCode == http.StatusSwitchingProtocols || res.Body == nil || res.Body == http.NoBody {
		ex.End = seconds(time.Now())
		t.rec.add(ex)
		return res, nil
	}
	tee := &teeBody{body: res.Body, limit: t.limit, held: t.held, finish: func(body []byte) {
		ex.End, ex.ResponseBody = seconds(time.Now()), body
		t.rec.add(ex)
	}}
	res.Body = tee
	return res, nil
}

// teeBody is a response body passed on as it is read, a copy kept for the recording: at its
// end (EOF) finish gets the copy. A body the browser stops reading (closed before its end),
// longer than limit, or that would take the copies of all answers in flight beyond the
// held budget, is not recorded: the replay will list its request as a miss.
type teeBody struct {
	body    io.ReadCloser
	kept    []byte
	limit   int64
	held    *budget
	counted int64 // bytes of held charged for kept's capacity
	over    bool
	ended   bool
	finish  func(body []byte)
}

// budget is the bytes all teeBodies may hold at once (-max-held-mib).
type budget struct {
	mu        sync.Mutex
	used, max int64
}

// charge takes n bytes (n < 0: gives them back); false when that would pass the maximum
// (nothing is taken then).
func (b *budget) charge(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > 0 && b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

// drop stops recording this body and gives its bytes back.
func (t *teeBody) drop() {
	t.over, t.kept = true, nil
	t.held.charge(-t.counted)
	t.counted = 0
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.body.Read(p)
	if n > 0 && !t.over {
		if int64(len(t.kept)+n) > t.limit {
			t.drop()
		} else {
			if len(t.kept)+n > cap(t.kept) {
				// grown here, charged first (doubling, as append would, up to the limit)
				grown := int64(2*cap(t.kept) + n)
				if grown > t.limit {
					grown = t.limit
				}
				if !t.held.charge(grown - t.counted) {
					t.drop()
					return n, err
				}
				buf := make([]byte, len(t.kept), grown)
				copy(buf, t.kept)
				t.kept, t.counted = buf, grown
			}
			t.kept = append(t.kept, p[:n]...)
		}
	}
	if err == io.EOF && !t.ended {
		t.ended = true
		if !t.over {
			t.finish(t.kept)
			t.held.charge(-t.counted) // the writer holds it now, briefly
			t.counted = 0
		}
	}
	return n, err
}

func (t *teeBody) Close() error {
	if !t.ended && !t.over {
		t.drop() // the browser went away before the end: nothing recorded
	}
	return t.body.Close()
}

// keepRawPath makes the request go out with the path as the browser sent it: Go's URL
// would escape |, ^, { and } again, and the browser's later request, sent raw, would not
// match the recording. Only a path Go would change is set (URL.Opaque); a plain-HTTP one
// going through a proxy upstream (viaProxy) in absolute form ("//host/path", as Go's
// documentation says: the proxy needs the host).
func keepRawPath(req *http.Request, viaProxy bool) {
	target := req.RequestURI
	if i := strings.Index(target, "://"); i >= 0 { // absolute form: a proxy request
		rest := target[i+3:]
		if j := strings.IndexAny(rest, "/?"); j >= 0 {
			target = rest[j:]
		} else {
			target = "/"
		}
	}
	if i := strings.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	if !strings.HasPrefix(target, "/") || strings.HasPrefix(target, "//") || target == req.URL.EscapedPath() {
		return
	}
	if req.URL.Scheme == "http" && viaProxy {
		req.URL.Opaque = "//" + req.URL.Host + target
	} else {
		req.URL.Opaque = target
	}
}

// originForm is u's path and query as the site got them ("/p?q"), whatever form keepRawPath
// gave the URL.
func originForm(u *url.URL) string {
	uri := u.RequestURI()
	if strings.HasPrefix(u.Opaque, "//") {
		uri = strings.TrimPrefix(uri, u.Scheme+"://"+u.Host)
	}
	return uri
}

// forwardAsSent answers req through forward without adding what the site did not send:
// Go's server would add a Content-Type guessed from the body and a Date.
func forwardAsSent(forward http.Handler, w http.ResponseWriter, req *http.Request, viaProxy bool) {
	keepRawPath(req, viaProxy)
	w.Header()["Content-Type"] = nil
	w.Header()["Date"] = nil
	forward.ServeHTTP(w, req)
}

func writeLines(path, bodiesPath string, lines <-chan *exchange, done chan<- error) {
	open := func(name string) (*os.File, *bufio.Writer, error) {
		file, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0600)
		if err != nil {
			return nil, nil, err
		}
		// written when 8 MiB are buffered and at the end
		return file, bufio.NewWriterSize(file, 8<<20), nil
	}
	file, out, err := open(path)
	if err != nil {
		done <- err
		return
	}
	bodiesFile, bodies, err := open(bodiesPath)
	if err != nil {
		done <- err
		return
	}
	encoder := json.NewEncoder(out)
	var offset int64
	for ex := range lines {
		for _, body := range []struct {
			data []byte
			at   *[2]int64
		}{{ex.RequestBody, &ex.RequestBodyAt}, {ex.ResponseBody, &ex.ResponseBodyAt}} {
			if _, err := bodies.Write(body.data); err != nil {
				done <- err
				return
			}
			*body.at = [2]int64{offset, int64(len(body.data))}
			offset += int64(len(body.data))
		}
		ex.RequestBody, ex.ResponseBody = nil, nil
		if err := encoder.Encode(ex); err != nil {
			done <- err
			return
		}
	}
	for _, w := range []*bufio.Writer{bodies, out} {
		if err := w.Flush(); err != nil {
			done <- err
			return
		}
	}
	if err := bodiesFile.Close(); err != nil {
		done <- err
		return
	}
	done <- file.Close()
}

// tunnels is the listener of the intercepted CONNECT tunnels: the TLS connections the inner
// HTTP server (HTTP/2 or HTTP/1.1, as the browser chose) serves.
type tunnels struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *tunnels) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *tunnels) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *tunnels) Addr() net.Addr { return &net.TCPAddr{} }

// prefixed is a hijacked connection read through the server's buffer.
type prefixed struct {
	net.Conn
	reader io.Reader
}

func (c prefixed) Read(p []byte) (int, error) { return c.reader.Read(p) }

func loadCA(path string) (*x509.Certificate, interface{}, error) {
	pem, err := ioutil.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	pair, err := tls.X509KeyPair(pem, pem)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %v", path, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	return cert, pair.PrivateKey, err
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on")
	caPath := flag.String("ca", "", "PEM file with the CA's key and certificate")
	outPath := flag.String("out", "", "file the exchanges are written to (JSON lines)")
	bodiesPath := flag.String("bodies", "", "file the exchanges' bodies are written to (raw)")
	hostsJSON := flag.String("hosts", "{}", `{"name": "addr[:port]"}: names dialled elsewhere`)
	trusted := flag.String("trusted", "", "PEM roots for the sites' certificates (default: the system's)")
	upstream := flag.String("upstream", "", "proxy URL the exchanges go through")
	maxBody := flag.Int64("max-body-mib", 256, "bodies recorded up to this size (MiB)")
	maxHeld := flag.Int64("max-held-mib", 1024, "copies of answers in flight held at once (MiB)")
	flag.Parse()
	fail := func(format string, args ...interface{}) {
		fmt.Fprintf(os.Stderr, "legato-web-recorder: "+format+"\n", args...)
		os.Exit(2)
	}
	quiet := log.New(ioutil.Discard, "", 0)

	hosts := map[string]string{}
	if err := json.Unmarshal([]byte(*hostsJSON), &hosts); err != nil {
		fail("-hosts: %v", err)
	}
	ca, key, err := loadCA(*caPath)
	if err != nil {
		fail("-ca: %v", err)
	}
	certs, err := mitm.NewConfig(ca, key)
	if err != nil {
		fail("-ca: %v", err)
	}
	certs.SetValidity(24 * time.Hour)
	certs.SetOrganization("legato web recorder")

	tlsConfig := &tls.Config{}
	if *trusted != "" {
		pem, err := ioutil.ReadFile(*trusted)
		if err != nil {
			fail("-trusted: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail("-trusted: no certificate in %s", *trusted)
		}
		tlsConfig.RootCAs = pool
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if mapped, ok := hosts[host]; ok && err == nil {
			addr = mapped
			if _, _, err := net.SplitHostPort(mapped); err != nil {
				addr = net.JoinHostPort(mapped, port) // "addr": the request's port
			}
		}
		return dialer.DialContext(ctx, network, addr)
	}
	transport := &http.Transport{
		DialContext:           dial,
		TLSClientConfig:       tlsConfig,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // bodies as the site sent them, in the encoding asked for
	}
	if *upstream != "" {
		u, err := url.Parse(*upstream)
		if err != nil || u.Host == "" {
			fail("-upstream: %q is no proxy URL", *upstream)
		}
		transport.Proxy = http.ProxyURL(u)
	}
	rec := &recorder{lines: make(chan *exchange, 4096)}
	forward := &httputil.ReverseProxy{
		// the request's URL is the site's already; no X-Forwarded-For (the site sees what
		// the browser sent)
		Director: func(req *http.Request) { req.Header["X-Forwarded-For"] = nil },
		Transport: recordingTransport{
			base: transport, rec: rec, limit: *maxBody << 20, held: &budget{max: *maxHeld << 20},
		},
		ErrorLog: quiet,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			http.Error(w, "legato-web-recorder: "+err.Error(), http.StatusBadGateway)
		},
	}

	// inside a tunnel: the browser's requests for that site (HTTP/2 or HTTP/1.1: net/http
	// configures HTTP/2 for *tls.Conn it accepts when the server has no TLSConfig)
	intercepted := &tunnels{conns: make(chan net.Conn), closed: make(chan struct{})}
	inner := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			req.URL.Scheme, req.URL.Host = "https", req.Host
			forwardAsSent(forward, w, req, *upstream != "")
		}),
		ErrorLog:          quiet,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
	}
	// the proxy itself: CONNECT opens a tunnel, other requests (http://) are forwarded
	outer := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method != http.MethodConnect {
				if req.URL.Host == "" {
					http.Error(w, "legato-web-recorder is a proxy", http.StatusBadRequest)
					return
				}
				forwardAsSent(forward, w, req, *upstream != "")
				return
			}
			hijacker, ok := w.(http.Hijacker)
			if !ok {
				http.Error(w, "no tunnel over this connection", http.StatusBadRequest)
				return
			}
			conn, buffered, err := hijacker.Hijack()
			if err != nil {
				return
			}
			if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
				conn.Close()
				return
			}
			site := certs.TLSForHost(req.Host)
			site.NextProtos = []string{"h2", "http/1.1"}
			// what the browser sent before the tunnel's answer is read first
			tunnel := prefixed{Conn: conn, reader: buffered.Reader}
			select {
			case intercepted.conns <- tls.Server(tunnel, site):
			case <-intercepted.closed:
				conn.Close()
			}
		}),
		ErrorLog:          quiet,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
	}

	written := make(chan error, 1)
	go writeLines(*outPath, *bodiesPath, rec.lines, written)
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		fail("-listen: %v", err)
	}
	go inner.Serve(intercepted)
	go func() {
		if err := outer.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			fail("-listen: %v", err)
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
	case err := <-written:
		fail("-out: %v", err)
	}
	// the attempt's end: what is still in flight is not written
	listener.Close()
	intercepted.Close()
	rec.close()
	if err := <-written; err != nil {
		fail("-out: %v", err)
	}
}
