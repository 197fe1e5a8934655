// The Go peer of the http workload: net/http's server (one goroutine per connection,
// keep-alive by default) answering "Hello, world!" on 127.0.0.1.
package main

import (
	"fmt"
	"net/http"
)

func serveHTTP(port int) error {
	body := []byte("Hello, world!")
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(body)
	})
	return http.ListenAndServe(fmt.Sprintf("127.0.0.1:%d", port), mux)
}
