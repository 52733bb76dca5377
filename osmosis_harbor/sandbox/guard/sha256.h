/* SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104): the manifest's and the report's signatures.
 * Part of guard.c's single translation unit. */

/* ── SHA-256 and HMAC ─────────────────────────────────────────────────────────────────── */

struct sha {
    u32 h[8];
    u8 blk[64];
    u64 len;
    u32 used;
};
static const u32 K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
static void sha_block(struct sha *s, const u8 *p) {
    u32 w[64], a, b, c, d, e, f, g, h;
    for (int i = 0; i < 16; i++)
        w[i] = (u32)p[4 * i] << 24 | (u32)p[4 * i + 1] << 16 | (u32)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        u32 s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        u32 s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        u32 t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        u32 t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d, s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}
static void sha_init(struct sha *s) {
    static const u32 iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->len = 0, s->used = 0;
}
static void sha_update(struct sha *s, const void *data, size_t n) {
    const u8 *p = data;
    s->len += n;
    while (n) {
        u32 take = 64 - s->used;
        if (take > n) take = (u32)n;
        memcpy(s->blk + s->used, p, take);
        s->used += take, p += take, n -= take;
        if (s->used == 64) sha_block(s, s->blk), s->used = 0;
    }
}
static void sha_final(struct sha *s, u8 out[32]) {
    u64 bits = s->len * 8;
    u8 pad = 0x80, zero = 0, lenb[8];
    sha_update(s, &pad, 1);
    while (s->used != 56) sha_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) lenb[i] = (u8)(bits >> (56 - 8 * i));
    sha_update(s, lenb, 8);
    for (int i = 0; i < 8; i++)
        out[4 * i] = (u8)(s->h[i] >> 24), out[4 * i + 1] = (u8)(s->h[i] >> 16), out[4 * i + 2] = (u8)(s->h[i] >> 8),
        out[4 * i + 3] = (u8)s->h[i];
}
struct hmac {
    struct sha inner;
    u8 okey[64];
};
static void hmac_init(struct hmac *m, const u8 key[32]) {
    u8 ik[64];
    memset(ik, 0x36, 64), memset(m->okey, 0x5c, 64);
    for (int i = 0; i < 32; i++) ik[i] ^= key[i], m->okey[i] ^= key[i];
    sha_init(&m->inner);
    sha_update(&m->inner, ik, 64);
}
static void hmac_final(struct hmac *m, u8 out[32]) {
    u8 ih[32];
    struct sha o;
    sha_final(&m->inner, ih);
    sha_init(&o);
    sha_update(&o, m->okey, 64);
    sha_update(&o, ih, 32);
    sha_final(&o, out);
}
