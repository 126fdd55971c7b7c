// The SIMT emulator's stand-in for CUDA's vector types: CUDA's members and
// alignments (the 16-byte types keep alignas(16), so a misaligned 16-byte
// access is a misaligned access to UBSan as it is to the GPU).
#ifndef PE_SIMT_INCLUDE_VECTOR_TYPES_H_
#define PE_SIMT_INCLUDE_VECTOR_TYPES_H_

#define PE_SIMT_VECTOR_TYPES(T, name, align2, align4)                        \
  struct name##1 { T x; };                                                   \
  struct alignas(align2) name##2 { T x, y; };                                \
  struct name##3 { T x, y, z; };                                             \
  struct alignas(align4) name##4 { T x, y, z, w; };                          \
  inline name##1 make_##name##1(T x) { return name##1 {x}; }                 \
  inline name##2 make_##name##2(T x, T y) { return name##2 {x, y}; }         \
  inline name##3 make_##name##3(T x, T y, T z) { return name##3 {x, y, z}; } \
  inline name##4 make_##name##4(T x, T y, T z, T w) {                        \
    return name##4 {x, y, z, w};                                             \
  }

PE_SIMT_VECTOR_TYPES(signed char, char, 2, 4)
PE_SIMT_VECTOR_TYPES(unsigned char, uchar, 2, 4)
PE_SIMT_VECTOR_TYPES(short, short, 4, 8)
PE_SIMT_VECTOR_TYPES(unsigned short, ushort, 4, 8)
PE_SIMT_VECTOR_TYPES(int, int, 8, 16)
PE_SIMT_VECTOR_TYPES(unsigned int, uint, 8, 16)
PE_SIMT_VECTOR_TYPES(long, long, 16, 16)
PE_SIMT_VECTOR_TYPES(unsigned long, ulong, 16, 16)
PE_SIMT_VECTOR_TYPES(long long, longlong, 16, 16)
PE_SIMT_VECTOR_TYPES(unsigned long long, ulonglong, 16, 16)
PE_SIMT_VECTOR_TYPES(float, float, 8, 16)
PE_SIMT_VECTOR_TYPES(double, double, 16, 16)
#undef PE_SIMT_VECTOR_TYPES

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

#endif  // PE_SIMT_INCLUDE_VECTOR_TYPES_H_
