// legato-web-recorder: the desktops' web recorder (recorder.py, issue 34). An HTTP(S) proxy
// (Google's martian: CONNECT, TLS interception with certificates signed by the recorder's
// CA, HTTP/1.1 on both sides) that writes every exchange it forwards, request and response
// bodies as they crossed the wire (not decoded), one JSON object a line, to -out. The desktop
// server turns that file into mitmproxy's flow file at the attempt's end (web_exchanges.py);
// replaying stays mitmproxy's. Written in Go because mitmproxy itself cost 1.2-2.1 ms of CPU
// per request inside the steps (BENCHMARKS.md, issue 34).
//
// Flags: -listen ADDR, -ca PEM (the CA's key and certificate: mitmproxy-ca.pem), -out FILE,
// -hosts JSON ({"name": "addr:port"} or {"name": "addr"}: names dialled elsewhere, for
// stand-in sites and mirrors; the TLS server name stays the name),
// -trusted PEM (the roots the sites' certificates are checked against; default: the
// system's), -upstream URL (a proxy the exchanges go through). SIGTERM: stop, flush, exit 0.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/ioutil"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/google/martian"
	mlog "github.com/google/martian/log"
	"github.com/google/martian/mitm"
)

// exchange is one line of -out (web_exchanges.py reads it): times in seconds since the epoch,
// headers in the order Go parsed them, bodies as sent (base64 in JSON).
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
	RequestBody     []byte      `json:"request_body"`
	Status          int         `json:"status"`
	Reason          string      `json:"reason"`
	ResponseVersion string      `json:"response_version"`
	ResponseHeaders [][2]string `json:"response_headers"`
	ResponseBody    []byte      `json:"response_body"`
}

const contextKey = "legato.exchange"

// recorder is martian's request and response modifier: it copies each body and queues the
// finished exchange for the writer goroutine.
type recorder struct {
	lines  chan *exchange
	mu     sync.Mutex
	closed bool
}

// close ends the queue: exchanges finishing later are not written.
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

func readAll(body io.ReadCloser) ([]byte, io.ReadCloser, error) {
	if body == nil || body == http.NoBody {
		return nil, body, nil
	}
	data, err := ioutil.ReadAll(body)
	body.Close()
	return data, ioutil.NopCloser(bytes.NewReader(data)), err
}

func (r *recorder) ModifyRequest(req *http.Request) error {
	if req.Method == "CONNECT" {
		return nil
	}
	data, body, err := readAll(req.Body)
	req.Body = body
	if err != nil {
		return err
	}
	port := 80
	if req.URL.Scheme == "https" {
		port = 443
	}
	if p := req.URL.Port(); p != "" {
		fmt.Sscanf(p, "%d", &port)
	}
	now := time.Now()
	ex := &exchange{
		Start:          float64(now.UnixNano()) / 1e9,
		Method:         req.Method,
		Scheme:         req.URL.Scheme,
		Host:           req.URL.Hostname(),
		Port:           port,
		Path:           req.URL.RequestURI(),
		HTTPVersion:    req.Proto,
		RequestHeaders: headerPairs(req.Header, req.Host),
		RequestBody:    data,
	}
	martian.NewContext(req).Set(contextKey, ex)
	return nil
}

func (r *recorder) ModifyResponse(res *http.Response) error {
	if res.Request == nil || res.Request.Method == "CONNECT" {
		return nil
	}
	value, ok := martian.NewContext(res.Request).Get(contextKey)
	if !ok {
		return nil
	}
	ex := value.(*exchange)
	data, body, err := readAll(res.Body)
	res.Body = body
	if err != nil {
		return err
	}
	ex.End = float64(time.Now().UnixNano()) / 1e9
	ex.Status = res.StatusCode
	ex.Reason = http.StatusText(res.StatusCode)
	if len(res.Status) > 4 {
		ex.Reason = res.Status[4:]
	}
	ex.ResponseVersion = res.Proto
	ex.ResponseHeaders = headerPairs(res.Header, "")
	ex.ResponseBody = data
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.lines <- ex
	}
	return nil
}

func writeLines(path string, lines <-chan *exchange, done chan<- error) {
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0600)
	if err != nil {
		done <- err
		return
	}
	// written when 8 MiB are buffered and at the end: the recording's memory stays bounded
	out := bufio.NewWriterSize(file, 8<<20)
	encoder := json.NewEncoder(out)
	for ex := range lines {
		if err := encoder.Encode(ex); err != nil {
			done <- err
			return
		}
	}
	if err := out.Flush(); err != nil {
		done <- err
		return
	}
	done <- file.Close()
}

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
	hostsJSON := flag.String("hosts", "{}", `{"name": "addr:port"}: names dialled elsewhere`)
	trusted := flag.String("trusted", "", "PEM roots for the sites' certificates (default: the system's)")
	upstream := flag.String("upstream", "", "proxy URL the exchanges go through")
	flag.Parse()
	fail := func(format string, args ...interface{}) {
		fmt.Fprintf(os.Stderr, "legato-web-recorder: "+format+"\n", args...)
		os.Exit(2)
	}
	mlog.SetLevel(mlog.Silent)

	hosts := map[string]string{}
	if err := json.Unmarshal([]byte(*hostsJSON), &hosts); err != nil {
		fail("-hosts: %v", err)
	}
	ca, key, err := loadCA(*caPath)
	if err != nil {
		fail("-ca: %v", err)
	}
	config, err := mitm.NewConfig(ca, key)
	if err != nil {
		fail("-ca: %v", err)
	}
	config.SetValidity(24 * time.Hour)
	config.SetOrganization("legato web recorder")

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
	dial := func(network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if mapped, ok := hosts[host]; ok && err == nil {
			addr = mapped
			if _, _, err := net.SplitHostPort(mapped); err != nil {
				addr = net.JoinHostPort(mapped, port) // "addr": the request's port
			}
		}
		return dialer.Dial(network, addr)
	}

	proxy := martian.NewProxy()
	proxy.SetRoundTripper(&http.Transport{
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
	})
	proxy.SetDial(dial)
	if *upstream != "" {
		u, err := url.Parse(*upstream)
		if err != nil || u.Host == "" {
			fail("-upstream: %q is no proxy URL", *upstream)
		}
		proxy.SetDownstreamProxy(u)
	}
	proxy.SetMITM(config)
	rec := &recorder{lines: make(chan *exchange, 4096)}
	proxy.SetRequestModifier(rec)
	proxy.SetResponseModifier(rec)

	written := make(chan error, 1)
	go writeLines(*outPath, rec.lines, written)
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		fail("-listen: %v", err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go proxy.Serve(listener)
	select {
	case <-stop:
	case err := <-written:
		fail("-out: %v", err)
	}
	// the attempt's end: what is still in flight is not written (its request went out,
	// its answer did not come back before the attempt ended)
	listener.Close()
	rec.close()
	if err := <-written; err != nil {
		fail("-out: %v", err)
	}
}
