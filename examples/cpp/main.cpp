// flashjit from C++: a context, device buffers owned by RAII handles, a causal grouped-query
// forward on whatever device the machine has (CUDA, else OpenCL), and a check of every output
// against a plain double-precision computation. Built with find_package (CMakeLists.txt here).
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <flashjit.h>

namespace {

void check(fj_context *ctx, fj_status st, const char *what)
{
    if (st != FJ_OK)
        throw std::runtime_error(std::string(what) + ": " + fj_status_string(st) + ": " +
                                 (ctx ? fj_context_last_error(ctx) : fj_last_create_error()));
}

using Context = std::unique_ptr<fj_context, decltype(&fj_context_destroy)>;

// Device memory of one context, freed with it in scope.
class DeviceBuffer {
  public:
    DeviceBuffer(fj_context *ctx, const std::vector<float> &host) : ctx_(ctx), bytes_(host.size() * 4)
    {
        check(ctx, fj_malloc(ctx, bytes_, &ptr_), "fj_malloc");
        check(ctx, fj_memcpy_h2d(ctx, ptr_, host.data(), bytes_), "fj_memcpy_h2d");
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    ~DeviceBuffer() { fj_free(ctx_, ptr_); }
    void *get() const { return ptr_; }
    std::vector<float> read() const
    {
        std::vector<float> host(bytes_ / 4);
        check(ctx_, fj_memcpy_d2h(ctx_, host.data(), ptr_, bytes_), "fj_memcpy_d2h");
        return host;
    }

  private:
    fj_context *ctx_;
    size_t bytes_;
    void *ptr_ = nullptr;
};

// [batch, seq, heads, dim], dense, float32.
fj_tensor bshd(void *data, int64_t b, int64_t s, int64_t h, int64_t d)
{
    return fj_tensor{data, FJ_DTYPE_F32, 4, {b, s, h, d}, {s * h * d, h * d, d, 1}};
}

} // namespace

int main()
{
    const int64_t b = 2, s = 77, hq = 4, hkv = 2, d = 48;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    auto random = [&](size_t n) {
        std::vector<float> x(n);
        for (auto &e : x)
            e = uniform(rng);
        return x;
    };
    const auto q = random(b * s * hq * d), k = random(b * s * hkv * d), v = random(b * s * hkv * d);

    fj_context_options opts;
    fj_context_options_init(&opts);
    opts.cache_path = ":memory:";
    fj_context *raw = nullptr;
    check(nullptr, fj_context_create(&opts, &raw), "fj_context_create");
    Context ctx(raw, &fj_context_destroy);
    fj_device_info info{};
    info.struct_size = sizeof info;
    check(ctx.get(), fj_context_get_device_info(ctx.get(), &info), "device info");

    DeviceBuffer dq(ctx.get(), q), dk(ctx.get(), k), dv(ctx.get(), v);
    DeviceBuffer dout(ctx.get(), std::vector<float>(q.size(), NAN));
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.causal = 1;
    fj_tensor tq = bshd(dq.get(), b, s, hq, d), tk = bshd(dk.get(), b, s, hkv, d);
    fj_tensor tv = bshd(dv.get(), b, s, hkv, d), tout = bshd(dout.get(), b, s, hq, d);
    check(ctx.get(), fj_attention_forward(ctx.get(), &desc, &tq, &tk, &tv, &tout, nullptr, nullptr),
          "fj_attention_forward");
    check(ctx.get(), fj_synchronize(ctx.get(), nullptr), "fj_synchronize");
    const auto out = dout.read();

    double worst = 0;
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < s; i++) {
                const int64_t g = h / (hq / hkv);
                std::vector<double> p(i + 1);
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double x = 0;
                    for (int64_t c = 0; c < d; c++)
                        x += q[((bi * s + i) * hq + h) * d + c] * k[((bi * s + j) * hkv + g) * d + c];
                    p[j] = x / std::sqrt(double(d));
                    m = std::fmax(m, p[j]);
                }
                for (auto &x : p)
                    sum += (x = std::exp(x - m));
                for (int64_t c = 0; c < d; c++) {
                    double o = 0;
                    for (int64_t j = 0; j <= i; j++)
                        o += p[j] / sum * v[((bi * s + j) * hkv + g) * d + c];
                    worst = std::fmax(worst, std::fabs(o - out[((bi * s + i) * hq + h) * d + c]));
                }
            }
    std::printf("flashjit %s on %s (%s): causal GQA forward, max error %.3g\n", fj_version(),
                info.name, info.arch, worst);
    return worst < 1e-4 ? 0 : 1;
}
