package idemgrpc

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/textproto"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// capture is the ServerTransportStream the handler sees: it keeps the
// metadata the handler sets, sent by sendMD once the call's outcome is
// known.
type capture struct {
	method          string
	header, trailer metadata.MD
}

func (c *capture) Method() string { return c.method }

func (c *capture) SetHeader(md metadata.MD) error {
	c.header = metadata.Join(c.header, md)
	return nil
}

func (c *capture) SendHeader(md metadata.MD) error { return c.SetHeader(md) }

func (c *capture) SetTrailer(md metadata.MD) error {
	c.trailer = metadata.Join(c.trailer, md)
	return nil
}

// sendMD hands header and trailer to the call's real stream.
func sendMD(ctx context.Context, header, trailer metadata.MD) error {
	if len(header) > 0 {
		if err := grpc.SetHeader(ctx, header); err != nil {
			return err
		}
	}
	if len(trailer) > 0 {
		if err := grpc.SetTrailer(ctx, trailer); err != nil {
			return err
		}
	}
	return nil
}

// storeMD writes md into h under prefix; see the package documentation.
func storeMD(h http.Header, prefix string, md metadata.MD) {
	for k, vs := range md {
		k = strings.ToLower(k)
		if strings.HasPrefix(k, "grpc-") || strings.HasPrefix(k, ":") || k == MetadataReplayed {
			continue
		}
		name := prefix + textproto.CanonicalMIMEHeaderKey(k)
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = base64.StdEncoding.EncodeToString([]byte(v))
			}
			h[name] = append(h[name], v)
		}
	}
}

// loadMD is the inverse of storeMD.
func loadMD(h http.Header) (header, trailer metadata.MD) {
	header, trailer = metadata.MD{}, metadata.MD{}
	for name, vs := range h {
		canon := textproto.CanonicalMIMEHeaderKey(name)
		var md metadata.MD
		var k string
		switch {
		case strings.HasPrefix(canon, headerPrefix):
			md, k = header, canon[len(headerPrefix):]
		case strings.HasPrefix(canon, trailerPrefix):
			md, k = trailer, canon[len(trailerPrefix):]
		default:
			continue
		}
		k = strings.ToLower(k)
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				b, err := base64.StdEncoding.DecodeString(v)
				if err != nil {
					continue
				}
				v = string(b)
			}
			md[k] = append(md[k], v)
		}
	}
	return header, trailer
}
